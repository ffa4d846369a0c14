"""Put back, after a GPU run re-executed the notebooks, the stored outputs of cells
tagged ``interpreter-output``: pictures that only Triton's CPU interpreter can draw
(course_lib.accesses records every load and store there), made by ``make test`` on a CPU.

    python scripts/restore_interpreter_outputs.py BEFORE_DIR NOTEBOOK...

BEFORE_DIR holds copies of the notebooks as they were before the GPU run.
"""

import json
import sys
from pathlib import Path

TAG = "interpreter-output"


def restore(before_dir, paths):
    for path in map(Path, paths):
        before = json.loads((Path(before_dir) / path.name).read_text())
        kept = {cell["id"]: cell["outputs"] for cell in before["cells"] if TAG in cell["metadata"].get("tags", [])}
        if not kept:
            continue
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            if cell.get("id") in kept:
                cell["outputs"] = kept.pop(cell["id"])
        if kept:
            raise SystemExit(f"{path}: cells {sorted(kept)} tagged {TAG} are gone after the run")
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: kept the interpreter's outputs of {TAG} cells")


if __name__ == "__main__":
    restore(sys.argv[1], sys.argv[2:])
