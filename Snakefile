# lpdl workflow entry point. The full paper grid (one train job per table cell, aggregation,
# report) is built in workflow/rules/; until it lands, the default target runs the core demo.
configfile: "config/config.yaml"


include: "workflow/rules/demo.smk"


rule all:
    input:
        "results/demo/table.txt",
