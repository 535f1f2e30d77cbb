"""The Chat page: talk with the model, with or without an adapter, and compare the two."""
