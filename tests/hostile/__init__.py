"""Hostile inputs, surface by surface: each case states what it proves (issue: trust
boundaries). A NOTIFY from a role with no grants, a name shaped like another tenant's id,
a run tree with a cycle, a run whose agent is gone: none may change another run, stall the
queue or loop forever."""
