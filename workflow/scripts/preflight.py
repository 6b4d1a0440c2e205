"""Snakemake script of the preflight job (workflow/rules/preflight.smk): `lpdl preflight` over the
invocation's resolved config (saved as the job's config.yaml), its verdicts in verdicts.txt and
printed, its progress in the log. The job succeeds also when a shape will not fit (exit 1 with a
step-times file): the verdicts say which."""
import subprocess
import sys
from pathlib import Path

import yaml

sm = snakemake  # noqa: F821  (injected by Snakemake)
Path(sm.output.config).write_text(yaml.safe_dump(dict(sm.config), sort_keys=False))
argv = [sys.executable, "-m", "lpdl_core", "preflight", "--directory", ".", "--configfile", sm.output.config,
        *sm.params.args, "--out", sm.output.times]
with open(sm.output.verdicts, "w") as out, open(sm.log[0], "w") as log:
    rc = subprocess.run(argv, stdout=out, stderr=log, stdin=subprocess.DEVNULL).returncode
sys.stderr.write(Path(sm.output.verdicts).read_text())
if rc != 0 and not (rc == 1 and Path(sm.output.times).is_file()):
    sys.stderr.write("".join(Path(sm.log[0]).read_text().splitlines(keepends=True)[-3:]))
    sys.exit(rc)
