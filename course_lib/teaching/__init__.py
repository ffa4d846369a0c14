"""The teaching tools: ``exercises`` (one checker an exercise, a module a chapter),
``checking`` (comparisons and ``ExerciseError``), ``accesses`` (the out-of-bounds access
recorder), ``notebook`` (what the chapters' notebooks share), the instructor tools:
``instructor`` (their command line), ``exercise_metadata``, ``student_copies``, ``execution``,
``grading`` and ``fresh_checker``, and the verdicts on returned answers: ``kernel_verdicts``
(kernels), ``torch_verdicts`` (PyTorch answers) and ``answer_source`` (what both read of an answer).

Nothing is imported here, so that ``import course_lib`` does not load them.
"""
