-- Numbering placeholder: migration 0016 belongs to another change and replaces this file.
select 1;
