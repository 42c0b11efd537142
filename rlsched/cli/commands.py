"""Import every command module so that it registers on the app."""

import rlsched.cli.advise_cmd
import rlsched.cli.backend_cmd
import rlsched.cli.gate_cmd
import rlsched.cli.market_cmd
import rlsched.cli.plan_cmd
import rlsched.cli.registry_cmd
import rlsched.cli.retrain_cmd
import rlsched.cli.service_cmd
import rlsched.cli.simulate_cmd
import rlsched.cli.spec_cmd
import rlsched.cli.trace_cmd
import rlsched.cli.train_cmd  # noqa: F401
