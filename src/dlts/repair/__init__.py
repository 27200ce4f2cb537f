"""The repair loop's pure core: the rules table (finding -> remediation chain) and the node state
machine (one transition table, one decision function). No database, no clock, no I/O: the impure
shell is ``dlts.managers.repair``; docs/repair.md describes both.
"""
