"""What a run leaves behind and how it is read: the SQLite store, its typed meta, the ranking, ``frontier.json``."""
