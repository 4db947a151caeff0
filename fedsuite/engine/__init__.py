"""The round engine: rounds from a config to records, the transports, the ServerApp and the ClientApp."""
