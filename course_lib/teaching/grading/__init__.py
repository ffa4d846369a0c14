"""Grading's pieces: the release a return comes from (:mod:`.release`), the copies of the package
it runs with (:mod:`.package_copy`), the notebook the grader runs (:mod:`.graded_notebook`) in the
sandbox (:mod:`.sandbox`), the answers judged in processes of their own (:mod:`.verdicts`), the
grading itself (:mod:`.grader`, with :mod:`.results`) and the instructor's gradebook, table and
feedback (:mod:`.gradebook`). ``python -m course_lib.teaching.instructor grade`` grades with them."""
