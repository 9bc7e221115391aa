"""The operator console's back end: its overview (``overview``, ``remotes``) and the dead letters
(``deadletters``). The page and its static files are served by functions/console.py, from
functions/console_static/."""
