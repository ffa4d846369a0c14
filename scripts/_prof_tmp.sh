site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:$site
mkdir -p $OUT/p
for k in layernorm softmax weighted_sum causal_softmax coor_descent; do
  timeout 100 python3 -m benchmarks.profile_step --kernel $k --python 30 > $OUT/p/$k.txt 2>&1
done
tar czf $OUT/prof.tgz -C $OUT p
