"""The pages of the main window, one step of the work each; a page never imports another."""
