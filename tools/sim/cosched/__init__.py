"""The coscheduling simulator's model of the nodes: parallel programs on time-shared PEs (issue 15).

- program.py: what a job runs (iterations of computation, I/O and a communication step);
- node.py: the event-driven model the simulator uses, told from outside what each process may do
  (records.py its records, slices.py its round-robin slices, local.py ClusterSchedSim's local scheduler
  and dynamic coscheduling, shortcut.py its walk of a job alone on its PEs);
- stepped.py: a fixed-step reference of the same model, slow and plain, that the tests hold node.py to.
"""
