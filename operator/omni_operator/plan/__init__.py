"""Pure placement planner: OmniDeployment spec -> Plan."""
