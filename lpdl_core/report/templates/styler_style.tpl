{#- Replaces pandas' html_style.tpl for the report's tables (report.table_style.Styler): no
    <style> element inside <body>; templates/report.css styles the tables by class. -#}
