"""The GPU check's study: where in-context copying emerges, baseline against the recipe's CPLM, both trained for the
same tokens (set by a time budget) on the code corpus of the machine's own installed Python sources, probed every N
steps, and scored beside their controls (benchmarks/gpu/study_step.py runs it as the GPU check's `study` step).

sizes       how big each phase is (the GPU's sizes and the CPU dry run's), the arms and the study's model
throughput  the throughput fit to the measured H200 runs, the arms' estimate and the candidate shapes
record      WORK_DIR/study.json, rewritten as each phase ends, and the phases timed into it
corpus      the code corpus of this machine's installed sources, its figures into the record
time_share  an arm's time share: the trainer's graceful stop (SIGUSR1) once its seconds have passed
training    the arms' overrides and training (the CPLM within its share, the baseline for as many iterations), their
            figures and probes from the run files (read through the toolkit's readers)
scoring     the arms' evaluation, the controls and the paired comparisons
experiment  its registration (registry.py) and its command line
"""
