"""The Export page and dialog: adapters and merged models llama.cpp loads, checked and verified."""
