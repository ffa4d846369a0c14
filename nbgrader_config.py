"""nbgrader's configuration for this repository (read by `make lab-instructor`'s formgrader and by
the nbgrader command line run from here). The course's own grader (`make grade`) reads nbgrader's
`submitted/<student>/<assignment>/` layout that this course folder holds; see book/instructor.md."""

c = get_config()  # noqa: F821  (nbgrader provides it)

c.CourseDirectory.root = "nbgrader"  # source/, release/, submitted/, autograded/, feedback/ and the gradebook
c.CourseDirectory.course_id = "triton-kernels"
# Triton's CPU interpreter is slow: a checker cell takes longer than nbgrader's 30 s default.
c.ExecutePreprocessor.timeout = 600
