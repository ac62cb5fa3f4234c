"""The job document users write (the TrainingJob), read into the port's typed job once,
at a platform's edge; its quantities parsed here."""
