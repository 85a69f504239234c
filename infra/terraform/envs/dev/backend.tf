# Remote state in S3 with S3-native locking (Terraform >= 1.10; no DynamoDB table).
# The bucket comes from infra/terraform/bootstrap; pass it at init:
#   terraform init -backend-config="bucket=<state bucket>" -backend-config="region=<region>"
terraform {
  backend "s3" {
    key          = "loraplex/dev/terraform.tfstate"
    encrypt      = true
    use_lockfile = true
  }
}
