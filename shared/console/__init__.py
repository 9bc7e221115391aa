"""The operator console's back end: its overview (``overview``, ``remotes``), the dead letters
(``deadletters``) and its static files (``assets``). The page itself is functions/console_static/."""
