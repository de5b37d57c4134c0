"""torchtitan: a readable Llama 3 pre-training framework."""
