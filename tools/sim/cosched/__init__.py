"""The coscheduling simulator's model of the nodes: parallel programs on time-shared PEs (issue 15).

- program.py: what a job runs (iterations of computation and a communication step);
- node.py: the event-driven model the simulator uses, told from outside what each process may do;
- stepped.py: a fixed-step reference of the same model, slow and plain, that the tests hold node.py to.
"""
