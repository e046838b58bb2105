"""The floor over core/: what runs a method on a pair. Loading pairs and their drafters
(models, specs, tuned), the round loop (loop), the public API (api) and the cost model with
its profiles (costs, profile). core/ below imports none of this or of any other package."""
