"""The platform contract: the port every platform answers (api), its bodies, errors,
fencing and registry. Nothing is re-exported here: import from the module that holds it."""
