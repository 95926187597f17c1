"""Plug-ins written the way a user writes them: one file each, named by dotted path in a scenario."""
