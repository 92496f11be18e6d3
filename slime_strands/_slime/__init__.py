"""Everything that reads or writes slime's objects: its ``args`` and ``GenerateState``, the ``Sample``
fields the trainer reads. slime is imported lazily and only where it exists.
"""
