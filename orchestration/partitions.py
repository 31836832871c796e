"""Daily partitions, starting at data.start_date of the code location's config.

The config file is chosen once, when the code location loads: $AIENG_CONFIG, else
configs/pipeline.yaml. That one file decides the partitions here and is the file every
AiengResource reads (resources.py), which refuses to run against a file that disagrees about
start_date. A bad file stops the load with one error naming the file and the key: the Dagster
CLI prints it, and the UI shows it as the code location's error.
"""

import dagster as dg

from aieng_core.config import load_config, resolve_config_path

CONFIG_PATH = resolve_config_path()
# Read once at load: what decides the definitions themselves (partitions, crons, intervals).
LOCATION_CONFIG = load_config(CONFIG_PATH)
START_DATE = LOCATION_CONFIG.data.start_date

daily_partitions = dg.DailyPartitionsDefinition(start_date=START_DATE.isoformat())

# Every asset runs a partition range in one run, so `dagster asset materialize
# --partition-range A...B` works from the CLI without a daemon.
single_run = dg.BackfillPolicy.single_run()
