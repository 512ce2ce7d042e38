"""The processor-allocation simulator: how many processors a job gets and when they are taken back (issue 17).

Jobs here are not programs but amounts of work with a speedup function (jobs.py): a job of work W on p
processors runs W / S(p) seconds, so a discipline's choice of size decides its runtime. Two papers'
disciplines run on it:

- Parsons and Sevcik's LSF disciplines (JSSPP 1997), on 16 workstations counted as 128 processors:
  lsf_workload.py (their section 6.1 workload), lsf_cluster.py (the event-driven machine with LSF's costs:
  dispatch, checkpoint, decision floor, quantum), lsf_rtc.py (run to completion: RTC, RTC-AD,
  RTC-ADSUBSET), lsf_preempt.py (simple preemption: PREEMPT, PREEMPT-AD), lsf_migrate.py (migration and
  malleability: MIG, MIG-AD(SUBSET), MALL-AD(SUBSET)); lsf_reproduce.py and lsf_report.py are
  ``storm sim reproduce lsf``.
- Naik, Setia and Squillante's partitioning policies (SC'93) on 512 processors: naik_workload.py (three
  classes, a substitute speedup model), naik_cluster.py (FP, AP, FPJP), naik_dynamic.py (DP and its
  two-phase reconfigurations); naik_reproduce.py and naik_report.py are ``storm sim reproduce naik``.

reproduce_cli.py is the command line of both; events.py the event queue both machines share.

The sizing and suspension decisions a real machine manager can make (RTC-AD and its SUBSET option, AP's
sizes, PREEMPT's rules) are storm-mm's own pure functions, mm/moldable.py and mm/preemption.py, called here
as storm-mm will call them. Migration and malleability (MIG, MALL, DP) need the application to checkpoint
or reconfigure itself: they exist only in this simulator, and the reports say so.
"""
