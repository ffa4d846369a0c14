"""Grading's pieces: the sandbox a return runs in (:mod:`.sandbox`) and the instructor's
gradebook and feedback (:mod:`.gradebook`). ``course_lib.teaching.instructor`` grades with them."""
