"""The Runs page: every training run and rating session found on disk, compared side by side."""
