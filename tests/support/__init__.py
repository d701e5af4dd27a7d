"""What the tests share: snapshot factories, the real-job harness, network namespaces, agents."""
