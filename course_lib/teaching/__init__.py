"""The teaching tools: ``exercises`` (one checker an exercise, a module a chapter),
``checking`` (comparisons and ``ExerciseError``), ``accesses`` (the out-of-bounds access
recorder), ``notebook`` (what the chapters' notebooks share), ``instructor`` and
``fresh_checker`` (student copies and grading).

Nothing is imported here, so that ``import course_lib`` does not load them.
"""
