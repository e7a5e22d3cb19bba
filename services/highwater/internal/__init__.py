"""Generated code of the protos the services speak among themselves."""
