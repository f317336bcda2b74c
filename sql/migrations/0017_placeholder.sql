-- Numbering placeholder: migration 0017 belongs to another change and replaces this file.
select 1;
