"""Widgets and look helpers shared by the pages (a page never imports another page)."""
