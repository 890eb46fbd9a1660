// The labelling page's keys: each button with data-key is clicked by its key (not while typing a comment or a name);
// the raw-text button switches every text to its raw view (the JSON string) and back, and is remembered per tab.
function setRaw(on) {
  document.body.classList.toggle("raw", on);
  try { sessionStorage.setItem("lrlhf-raw", on ? "1" : "0"); } catch (e) { /* storage off: the view still switches */ }
}
document.addEventListener("DOMContentLoaded", function () {
  try { if (sessionStorage.getItem("lrlhf-raw") === "1") document.body.classList.add("raw"); } catch (e) {}
  var toggle = document.getElementById("toggle-raw");
  if (toggle) toggle.addEventListener("click", function () { setRaw(!document.body.classList.contains("raw")); });
});
document.addEventListener("keydown", function (event) {
  var target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
  if (target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT")) return;
  var button = document.querySelector('button[data-key="' + event.key.toLowerCase() + '"]');
  if (!button || button.disabled) return;
  event.preventDefault();
  if (button.type === "button") { button.click(); return; }  // the raw view: no form to send
  button.disabled = true;  // one decision per page: a held or repeated key submits once
  var form = button.form;
  var field = document.createElement("input");
  field.type = "hidden"; field.name = button.name; field.value = button.value;
  if (button.name) form.appendChild(field);
  form.submit();
});
