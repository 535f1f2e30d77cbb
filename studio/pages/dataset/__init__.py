"""The Dataset page: the table of samples, the editor of one sample, the token view."""
