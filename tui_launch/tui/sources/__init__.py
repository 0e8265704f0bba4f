"""What the dashboard reads and sends commands to: the ``Source`` protocol and its kinds.

- ``live``: the ``Source`` protocol and ``LiveSource``, a live run through its ``RunHandle``.
- ``replay``: a recorded journal at a cursor, through a journal ``Timeline``.
- ``attach``: the replay source following a live journal's end, read-only.
- ``control``: the attached source whose commands go over the run's control socket.
"""
