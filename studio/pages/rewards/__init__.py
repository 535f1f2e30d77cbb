"""The Rewards page: rate sampled answers and train on the ratings."""
