"""`aieng doctor`: this machine's resources against what the configuration needs."""
