"""Config documents: which ones apply to a job (`matching`, pure), following an env's
``config.changes`` (`feed`, for the gateway and the brain), and a training job's client
of the gateway (`client`, shipped with the SDK).
"""
