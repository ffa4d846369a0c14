"""One checker per exercise, a module a chapter (``chapter1`` ... ``chapter7``). Each runs
the student's code on fresh random inputs of several shapes, compares with the
references, prints one line starting ``Exercise N.M passed`` or raises
:class:`~course_lib.teaching.checking.ExerciseError` saying what is wrong and where.

Every checker is importable from here: ``exercises.check_scale_columns(scale_columns_kernel)``.
A kernel exercise's checker takes the ``@triton.jit`` kernel itself and launches it with the
chapter's ``launch_<name>`` (exported too), interpreted and guarded first, then compiled on a
GPU (:mod:`course_lib.teaching.student_kernels`).
"""

from . import chapter1, chapter2, chapter3, chapter4, chapter5, chapter6, chapter7, common
from .chapter1 import *  # noqa: F401,F403  (each chapter module's __all__: its checkers and launchers)
from .chapter2 import *  # noqa: F401,F403
from .chapter3 import *  # noqa: F401,F403
from .chapter4 import *  # noqa: F401,F403
from .chapter5 import *  # noqa: F401,F403
from .chapter6 import *  # noqa: F401,F403
from .chapter7 import *  # noqa: F401,F403

CHAPTERS = (chapter1, chapter2, chapter3, chapter4, chapter5, chapter6, chapter7)
# Every exercise of the course, in order: what the instructors' notes list.
EXERCISES = tuple(exercise for chapter in CHAPTERS for exercise in chapter.EXERCISES)
__all__ = [name for chapter in CHAPTERS for name in chapter.__all__] + ["EXERCISES"]
