"""The parts of the main window (studio.main_window) that read well on their own: the page area and
the navigation's width (`page_area`), the menus and Help's contents (`menus`), the status bar
(`status`), the first-run strip's ticks (`first_run`), the theme (`look`), the recent files
(`recent`) and the offer of autosaved changes after a crash (`recovery`). Functions of the window
take it as `w` and make or read its attributes; none imports the window's module."""
