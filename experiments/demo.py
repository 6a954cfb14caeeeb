"""`make demo`: placeholder until the simulation drivers land (replaced by the EMNIST BLT demo)."""

from dp_ftrl_tff.mechanisms import participation


def main():
  schema = participation.ParticipationSchema.min_separation(min_sep=342, max_participations=6)
  print(f'dp_ftrl_tff demo: {schema}, effective k at n=2052: '
        f'{schema.effective_max_participations(2052)}')


if __name__ == '__main__':
  main()
