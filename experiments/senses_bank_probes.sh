#!/bin/sh
# `elmokit similar` on hand-written bank probes (money vs river), neighbours from elmokit-en's held-out text:
#   ELMOKIT_CACHE=/work/cache sh experiments/senses_bank_probes.sh
# writes experiments/results/senses-bank-probes.{txt,png}
set -e
cd "$(dirname "$0")/.."
python -m elmokit similar elmokit-en experiments/senses_bank_probes.txt --word bank --labels \
    --corpus "${ELMOKIT_CACHE:?set ELMOKIT_CACHE}/zoo/elmokit-en/corpus/heldout.txt" --neighbours 5 \
    --png experiments/results/senses-bank-probes.png > experiments/results/senses-bank-probes.txt.tmp
mv experiments/results/senses-bank-probes.txt.tmp experiments/results/senses-bank-probes.txt
cat experiments/results/senses-bank-probes.txt
