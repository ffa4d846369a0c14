"""Run every benchmark on the GPU and write benchmarks/results/<gpu>.json.

    python -m benchmarks            # all kernels
"""

from course_lib.benchmarking import copy_bandwidth_gbps, require_gpu, write_results

from . import bench_weighted_sum

MODULES = [bench_weighted_sum]


def main():
    require_gpu("the benchmarks")
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy bandwidth C = {copy_gbps:.0f} GB/s")
    rows = []
    for module in MODULES:
        rows += module.run(copy_gbps)
    for r in rows:
        print(f"{r['kernel']:>14} {r['pass']} {r['impl']:>13} {r['dtype']:>8} {str(r['shape']):>16} "
              f"{r['ms']:8.4f} ms  {r['frac_of_copy']:.2f} C")
    print("wrote", write_results(rows, copy_gbps))


if __name__ == "__main__":
    main()
