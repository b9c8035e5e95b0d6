# tests/bench/tally.py: the counting check the tests/bench scripts share: a failed check prints
# its message and the run goes on, so one run shows every failure; done() prints the tally.


class Tally:
    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, cond, msg):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL %s" % msg, flush=True)

    def done(self):
        """Prints 'NAME: N passed, N failed'; the exit status for the script."""
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        return 1 if self.failed else 0
