"""The hosts platform (issue 35): an env's TrainingJobs on plain machines, one agent
(handlers.agent) per machine, told what to run over the bus."""
