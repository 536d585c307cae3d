"""The tidemq processes: nameserver and broker, and the runtime they share."""
