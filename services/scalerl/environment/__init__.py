"""What a model's episode runs against: the tools it calls while it thinks (`tools`: the call format,
python in the sandbox, a calculator). The multi-turn loop that interleaves turns and observations is the
generator's (`scalerl.generator.episode`)."""
