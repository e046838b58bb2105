"""What runs a method on a pair, over execution/, kernels/, contract/ and core/. Loading
pairs and their drafters (models, specs, tuned), what a run starts from (inputs: the prompt,
the parameters), the round loop (loop), the public API (api; hf_run: a run of transformers'
own modes), the pacing hook between a run's rounds (pacing) and the cost model with its
profiles (costs, profile; profile_store: measured ones kept per machine class). The
floors below import none of this."""
