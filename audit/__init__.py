"""`jetraft audit`: replay every node's Raft logs on Spark and check the replicas agree.

Module map (one concern each; the pure ones import no Spark):

    model.py    Finding, severities and kinds, the row layouts shared by the stages
    layout.py   find each node's WAL, archive and snapshot dirs; plan byte-range splits
    segread.py  pure: decode one byte range of a segment (raft.wal.Scanner), resync past damage
    stitch.py   pure: check the splits of a segment tile it, grade damage (torn tail / corrupt)
    logpass.py  pure: one node's log of one group, newest record first: survivors, gaps, votes
    snapmeta.py pure, read-only: the snapshot meta files (`snap/<hex group>.meta`)
    acked.py    pure: the acknowledged-writes file (JSON lines)
    keyring.py  the key of stores encrypted at rest: checked on the driver, used read-only
    hooks.py    per-group replay hooks (store = replay, meta group) that run inside Spark
    hook_lmdbsm.py  the hook for raft.node's LMDB append-log store (JetStream's comes next)
    checks.py   the cross-node checks, as Spark DataFrame jobs
    verdicts.py pure: coverage and missing-entry verdicts from the log pass, on the driver
    job.py      the Spark job: session, code shipping, stages; `spark-submit audit/job.py`
    progress.py the progress line while Spark works
    report.py   report.json; page.py report.html with matplotlib plots
"""
