"""What should I run here? One engine predicts the tokens/s of any configuration (draft backend and
precision, target backend and precision, K) from measured costs and acceptance, and ranks them."""
