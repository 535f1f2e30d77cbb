"""The Train page: settings, start / pause / resume / stop, live plots and log."""
