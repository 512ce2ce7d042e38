"""The job store's SQLite schema (mm/store.py): the tables and indexes of the newest version, and the steps
that bring a store written by an older storm-mm up to it."""

from __future__ import annotations

from storm.mm.states import ACTIVE_STATES, JobState

SCHEMA_VERSION = 8


def sql_states(states: frozenset[JobState]) -> str:
    """An SQL list of job states, in JobState's order: the same text on every start."""
    return "(" + ", ".join(f"'{s}'" for s in JobState if s in states) + ")"


UNFINISHED = sql_states(frozenset(s for s in JobState if not s.terminal))  # queued or holding PEs
PLACED = sql_states(ACTIVE_STATES)  # holding PEs

# What turns a store of version N into version N + 1 (the schema below is always the newest).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: jobs go back to the queue after a node failure (submit --requeue), and count how often.
    1: ("ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0",),
    # 3: a placed job's PMI name, so that a restarted MM can send a launch a node missed (jobs placed by an
    # older storm-mm have none: a node that missed theirs loses the job, as it did then).
    2: ("ALTER TABLE jobs ADD COLUMN kvsname TEXT NOT NULL DEFAULT ''",),
    # 4: which of a placed job's nodes share a host (its launches tell MPI), for the same reason.
    3: ("ALTER TABLE jobs ADD COLUMN hosts TEXT NOT NULL DEFAULT ''",),
    # 5: on a torus, the box a job holds ('' elsewhere, and for jobs of an older storm-mm).
    4: ("ALTER TABLE jobs ADD COLUMN box TEXT NOT NULL DEFAULT ''",),
    # 6: preemption by suspension: which job suspended a running one, since when, and its last resume (NULL:
    # never, as for every job of an older storm-mm). A moldable job's range, its QOS and priority are in the
    # spec (absent from older specs: a fixed size, normal, 0).
    5: (
        "ALTER TABLE jobs ADD COLUMN suspended_by INTEGER",
        "ALTER TABLE jobs ADD COLUMN suspended_at REAL",
        "ALTER TABLE jobs ADD COLUMN resumed_at REAL",
    ),
    # 7: accounting (storm history): who submitted a job, its name and size in columns of their own (filled
    # from the specs of older jobs), what it used (CPU seconds, FCS class seconds: NULL, not measured), and
    # the index the time window uses (jobs that had not ended by --since).
    6: (
        "ALTER TABLE jobs ADD COLUMN uid INTEGER NOT NULL DEFAULT -1",
        "ALTER TABLE jobs ADD COLUMN user TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN name TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE jobs ADD COLUMN ranks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE jobs ADD COLUMN cpu_user REAL",
        "ALTER TABLE jobs ADD COLUMN cpu_system REAL",
        "ALTER TABLE jobs ADD COLUMN time_cs REAL",
        "ALTER TABLE jobs ADD COLUMN time_f REAL",
        "ALTER TABLE jobs ADD COLUMN time_dc REAL",
        "UPDATE jobs SET uid = storm_spec(spec, 'uid'), user = storm_spec(spec, 'user'),"
        " name = storm_spec(spec, 'name'), ranks = storm_spec(spec, 'ranks')",
        "CREATE INDEX IF NOT EXISTS jobs_end ON jobs (end_time)",
    ),
    # 8: job arrays: a task's array id (its first task's job id) and task id (NULL outside arrays), indexed
    # for `storm show 123_7`, `storm cancel 123` and a dependency on a whole array. The array's task ids and
    # limit and a job's dependency are in the spec (absent from older specs: none). INDEXES makes the index.
    7: (
        "ALTER TABLE jobs ADD COLUMN array_id INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_task INTEGER",
    ),
}

# Indexes on columns a migration adds: made after the migrations (the schema script runs before them, on an
# older table without those columns).
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_array ON jobs (array_id, array_task) WHERE array_id IS NOT NULL;
"""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- kvsname: the PMI name of the job's current (or last) run. Its launches carry it and MPICH names its shared
-- memory after it; it is random per run, so it is kept for a restarted MM to send a lost launch again.
-- hosts: the host number of each of its nodes, as its launches give them (comma-separated; '': none).
-- box: on a torus, the box it holds, 'x,y,z/a,b,c' (base / shape); '' on a flat network.
-- suspended_by, suspended_at: while preemption holds a running job's ranks stopped, the job that suspended it
-- and since when (NULL otherwise); resumed_at: its last resume.
-- uid, user, name, ranks: the spec's, for storm history's filters (ranks: the size asked, a moldable job's
-- least). cpu_user, cpu_system: its ranks' CPU seconds; time_cs, time_f, time_dc: under FCS, its ranks'
-- seconds per class (mm/accounting.py); NULL until it ends, or not measured.
-- array_id, array_task: a task of a job array, its array's id (the first task's job id) and its task id.
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    state TEXT NOT NULL,
    spec BLOB NOT NULL,
    submit_time REAL NOT NULL,
    start_time REAL,
    end_time REAL,
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    placement BLOB NOT NULL,
    row INTEGER,
    ending TEXT,
    suspended_time REAL NOT NULL DEFAULT 0,
    requeues INTEGER NOT NULL DEFAULT 0,
    kvsname TEXT NOT NULL DEFAULT '',
    hosts TEXT NOT NULL DEFAULT '',
    box TEXT NOT NULL DEFAULT '',
    suspended_by INTEGER,
    suspended_at REAL,
    resumed_at REAL,
    uid INTEGER NOT NULL DEFAULT -1,
    user TEXT NOT NULL DEFAULT '',
    name TEXT NOT NULL DEFAULT '',
    ranks INTEGER NOT NULL DEFAULT 0,
    cpu_user REAL,
    cpu_system REAL,
    time_cs REAL,
    time_f REAL,
    time_dc REAL,
    array_id INTEGER,
    array_task INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_active ON jobs (state)
    WHERE state IN {UNFINISHED};
CREATE INDEX IF NOT EXISTS jobs_end ON jobs (end_time);
-- The last PMI barrier each running job completed: a node that missed its answer (the MM restarted in
-- between) asks again and gets the same answer.
CREATE TABLE IF NOT EXISTS barriers (
    job_id INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    kvs BLOB NOT NULL
);
-- FCS's timeline: every class change of every process, as its node reported it.
CREATE TABLE IF NOT EXISTS class_changes (
    job_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    time REAL NOT NULL,
    old TEXT NOT NULL,
    new TEXT NOT NULL,
    tslots INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS class_changes_job ON class_changes (job_id, time);
CREATE TABLE IF NOT EXISTS profiles (
    job_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    klass TEXT NOT NULL,
    wall REAL NOT NULL,
    compute REAL NOT NULL,
    poll REAL NOT NULL,
    blocked REAL NOT NULL,
    stopped REAL NOT NULL,
    queued REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS profiles_job ON profiles (job_id);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    pes INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '',
    last_seen REAL NOT NULL
);
-- A node's final report on a job that still runs elsewhere (its ranks' exits), until the job ends: a
-- restarted MM must not take a node that finished its part (and forgot the job) for one that lost it.
CREATE TABLE IF NOT EXISTS node_exits (
    job_id INTEGER NOT NULL,
    node TEXT NOT NULL,
    exits BLOB NOT NULL,
    PRIMARY KEY (job_id, node)
);
"""
